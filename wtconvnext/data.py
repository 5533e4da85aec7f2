"""Data helpers for ``train.py`` and ``validate.py``.

Two things live here:

* The embedded default dataset: scikit-learn's bundled handwritten digits (1797 images, 8x8, 10 classes) written
  once as an ImageFolder (``train/`` and ``val/``, a deterministic stratified 80/20 split, upscaled RGB PNGs), so
  that ``python train.py`` runs with no download and no arguments.
* Reproducible, resumable sampling. The data order of an epoch is a function of ``(seed, epoch)`` only, and every
  sample is augmented under RNGs seeded from ``(seed, epoch, position in the epoch)``. A run killed mid-epoch can
  therefore skip the samples it already consumed and continue with exactly the batches, crops, flips and erasings
  an uninterrupted run would see, whatever the number of loader workers, and (with the same global batch) whatever
  the number of processes.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Optional, Sequence, Union

import numpy as np
import torch
from torch.utils.data import Dataset, Sampler, get_worker_info

__all__ = [
    "DIGITS_NUM_CLASSES",
    "DataError",
    "ResumableSampler",
    "SeededDataset",
    "ShardSampler",
    "create_dataset_checked",
    "data_root",
    "digits_root",
    "mix_seed",
    "patch_timm_posterize",
    "posterize_compat",
    "prepare_digits",
    "seed_rngs",
    "seed_worker",
]

DIGITS_NUM_CLASSES = 10
# Bumped whenever the written files would change, so that an old cache is rebuilt rather than silently reused.
_DIGITS_FORMAT = "digits-v1"


def data_root() -> Path:
    """Root of the dataset cache: ``$WTCONVNEXT_DATA`` if set, else ``./data`` (git-ignored)."""
    return Path(os.environ.get("WTCONVNEXT_DATA", "data"))


def digits_root(size: int = 32) -> Path:
    """Where :func:`prepare_digits` writes the embedded dataset at ``size`` pixels."""
    return data_root() / ("digits" if size == 32 else f"digits{size}")


def prepare_digits(
        root: Optional[Union[str, Path]] = None,
        size: int = 32,
        val_fraction: float = 0.2,
        split_seed: int = 0,
) -> Path:
    """Write scikit-learn's digits as an ImageFolder (``root/train/<digit>/*.png``, ``root/val/<digit>/*.png``).

    Idempotent and safe to call from several processes at once (e.g. every rank of a torchrun job): the tree is
    built in a temporary sibling folder and renamed into place, so a reader sees either nothing or the whole set.

    Args:
        root: target folder; default :func:`digits_root`.
        size: side of the written square images. The 8x8 originals are upscaled bicubically so that the stem's
            stride-4 patchify and three 2x downsamplings leave a non-trivial map.
        val_fraction: share of every class held out for ``val/`` (stratified, so both splits are balanced).
        split_seed: seed of the split; fixed so that ``val/`` is the same held-out set on every machine.

    Returns:
        The dataset root.
    """
    root = Path(root) if root is not None else digits_root(size)
    marker = root / _DIGITS_FORMAT
    if marker.exists():
        return root
    # Imported here: scikit-learn and Pillow are only needed the first time the cache is built.
    from PIL import Image
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    images = np.asarray(digits.images, dtype=np.float64)  # (1797, 8, 8), values 0..16
    labels = np.asarray(digits.target, dtype=np.int64)
    idx_train, idx_val = train_test_split(
        np.arange(len(labels)), test_size=val_fraction, stratify=labels, random_state=split_seed)

    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{root.name}-", dir=root.parent))
    try:
        for split, indices in (("train", idx_train), ("val", idx_val)):
            for c in range(DIGITS_NUM_CLASSES):
                (tmp / split / str(c)).mkdir(parents=True)
            for i in sorted(indices.tolist()):
                pixels = np.clip(np.rint(images[i] * (255.0 / 16.0)), 0, 255).astype(np.uint8)
                img = Image.fromarray(pixels, mode="L").resize((size, size), Image.BICUBIC).convert("RGB")
                img.save(tmp / split / str(labels[i]) / f"{i:04d}.png")
        (tmp / _DIGITS_FORMAT).write_text(f"{len(idx_train)} train, {len(idx_val)} val, {size}x{size}\n")
        if root.exists() and not marker.exists():
            # An outdated tree (older format, or written by hand): replace it. A tree with the current marker
            # was just renamed into place by a concurrent process and is left alone.
            shutil.rmtree(root, ignore_errors=True)
        try:
            os.rename(tmp, root)
        except OSError:
            # Another process won the race and renamed its identical tree first.
            if not marker.exists():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return root


def mix_seed(*values: int) -> int:
    """A well-mixed 63-bit seed from a tuple of integers (e.g. ``(seed, epoch, position)``).

    Nearby tuples give unrelated seeds (SeedSequence hashing), unlike ``seed + epoch`` style sums that make epoch 1
    of seed 0 replay epoch 0 of seed 1.
    """
    # The length leads the entropy so that tuples of different lengths can never hash alike.
    entropy = [len(values)] + [v % (1 << 64) for v in values]
    words = np.random.SeedSequence(entropy).generate_state(2, dtype=np.uint32)
    return (int(words[0]) << 31) ^ int(words[1])


def seed_rngs(seed: int) -> None:
    """Seed Python's, NumPy's and torch's global RNGs (torch's CUDA generators included) from one integer."""
    random.seed(seed)
    np.random.seed(seed % (1 << 32))
    torch.manual_seed(seed)


@contextmanager
def _sample_rng(seed: int) -> Iterator[None]:
    """Run a sample's transform under RNGs seeded with ``seed``.

    In a loader worker the global RNGs belong to the worker, so they are simply reseeded. In the main process
    (``workers=0``) they are saved and restored around the sample: otherwise loading would shift the RNG stream
    that drop path and mixup draw from, and results would depend on the number of workers.
    """
    if get_worker_info() is not None:
        random.seed(seed)
        np.random.seed(seed % (1 << 32))
        torch.default_generator.manual_seed(seed)  # CPU only: transforms run on the CPU
        yield
        return
    py_state, np_state, torch_state = random.getstate(), np.random.get_state(), torch.get_rng_state()
    try:
        random.seed(seed)
        np.random.seed(seed % (1 << 32))
        torch.default_generator.manual_seed(seed)
        yield
    finally:
        random.setstate(py_state)
        np.random.set_state(np_state)
        torch.set_rng_state(torch_state)


class SeededDataset(Dataset):
    """Wraps a map-style dataset; indexed by ``(index, seed)`` pairs, it transforms each sample under its own seed.

    Pair it with :class:`ResumableSampler`, which yields those pairs. The wrapped dataset's ``transform`` attribute
    is exposed so that timm-style code that sets ``dataset.transform`` keeps working.
    """

    def __init__(self, dataset: Dataset) -> None:
        if isinstance(dataset, torch.utils.data.IterableDataset):
            raise TypeError("reproducible, resumable sampling needs a map-style dataset (e.g. an ImageFolder)")
        self.dataset = dataset

    @property
    def transform(self):
        return getattr(self.dataset, "transform", None)

    @transform.setter
    def transform(self, value) -> None:
        self.dataset.transform = value

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, item: tuple[int, int]):
        index, seed = item
        with _sample_rng(seed):
            return self.dataset[index]


class ResumableSampler(Sampler):
    """Epoch-seeded shuffling that can start part-way into an epoch; yields ``(index, sample_seed)`` pairs.

    The epoch's order is a permutation drawn from ``(seed, epoch)``, padded by wrapping around (as torch's
    DistributedSampler does) to a multiple of ``num_replicas``; rank ``r`` takes global positions ``r, r + R, ...``.
    Sample seeds are functions of the global position, so a global batch of ``R * b`` samples holds the same
    samples with the same augmentations for any ``R``.

    Args:
        num_samples: length of the dataset.
        seed: run seed.
        shuffle: permute per epoch (training); False keeps dataset order.
        num_replicas: number of data-parallel processes.
        rank: this process's rank.
    """

    def __init__(self, num_samples: int, seed: int = 0, shuffle: bool = True, num_replicas: int = 1, rank: int = 0):
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank {rank} outside [0, {num_replicas})")
        self.num_samples = num_samples
        self.seed = seed
        self.shuffle = shuffle
        self.num_replicas = num_replicas
        self.rank = rank
        self.per_rank = -(-num_samples // num_replicas)  # ceil: padded so every rank runs the same number of steps
        self.epoch = 0
        self.start = 0

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        """Select the epoch and how many of this rank's samples to skip (those consumed before an interruption)."""
        if not 0 <= start <= self.per_rank:
            raise ValueError(f"start {start} outside [0, {self.per_rank}]")
        self.epoch = epoch
        self.start = start

    def epoch_order(self, epoch: int) -> np.ndarray:
        """The epoch's global order of dataset indices, padded to ``per_rank * num_replicas``."""
        if self.shuffle:
            order = np.random.default_rng(mix_seed(self.seed, epoch)).permutation(self.num_samples)
        else:
            order = np.arange(self.num_samples)
        total = self.per_rank * self.num_replicas
        if total > len(order):
            order = np.concatenate([order, np.resize(order, total - len(order))])
        return order

    def __iter__(self) -> Iterator[tuple[int, int]]:
        order = self.epoch_order(self.epoch)
        for j in range(self.start, self.per_rank):
            pos = self.rank + j * self.num_replicas
            yield int(order[pos]), mix_seed(self.seed, self.epoch, pos)

    def __len__(self) -> int:
        return self.per_rank - self.start


class ShardSampler(Sampler):
    """Rank ``r`` of ``R`` takes indices ``r, r + R, ...``, without padding, so that summing per-rank results
    counts every evaluation sample exactly once (timm's OrderedDistributedSampler pads with duplicates)."""

    def __init__(self, num_samples: int, num_replicas: int = 1, rank: int = 0) -> None:
        self.indices: Sequence[int] = range(rank, num_samples, num_replicas)

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)


def posterize_compat(img, bits_to_keep: int, **__):
    """timm's ``posterize`` augmentation op, also valid on Pillow >= 13.

    RandAugment's ``PosterizeIncreasing`` maps the top magnitude (reached under ``mstd`` noise, as in the reference
    recipe ``rand-m9-mstd0.5-inc1``) to 0 bits kept. Pillow < 13 turned that into a black image; Pillow 13 raises
    ``ValueError: bits must be between or equal to 1 and 8``, which kills the loader mid-epoch.
    """
    from PIL import ImageOps

    if bits_to_keep >= 8:
        return img
    if bits_to_keep <= 0:
        return img.point([0] * (256 * len(img.getbands())))  # Pillow < 13's result: every value masked to 0
    return ImageOps.posterize(img, bits_to_keep)


def patch_timm_posterize() -> None:
    """Route timm's RandAugment / AutoAugment posterize ops through :func:`posterize_compat`.

    Must run before the transforms are built: each op captures its function from ``NAME_TO_OP`` when created.
    """
    from timm.data import auto_augment

    for name in ("Posterize", "PosterizeIncreasing", "PosterizeOriginal"):
        if auto_augment.NAME_TO_OP.get(name) is auto_augment.posterize:
            auto_augment.NAME_TO_OP[name] = posterize_compat


def seed_worker(worker_id: int, seed: int = 0) -> None:
    """``worker_init_fn``: seed a loader worker from ``(seed, worker_id)``.

    Per-sample seeding (:class:`SeededDataset`) already fixes every random draw made by transforms; this covers
    anything else a worker might draw (a custom collate, say) so that no worker starts from an arbitrary state.
    """
    seed_rngs(mix_seed(seed, -1, worker_id))  # -1: no epoch (persistent workers outlive epochs)


class DataError(ValueError):
    """A dataset cannot be used as given (missing or empty directory, unknown class map...): a one-line message."""


def create_dataset_checked(name: str, root: Optional[str], split: str, download: bool = False,
                           class_map: str = "", **kwargs) -> Dataset:
    """timm's ``create_dataset``, with the mistakes a user makes reported as one-line :class:`DataError`s.

    timm answers a missing folder root with a bare ``AssertionError`` and an empty one with a ``RuntimeError``
    from deep inside its reader; this names the directory (or class map) and the split instead.

    Args:
        name: timm dataset name ('' for an image folder; ``torch/...``, ``hfds/...``, ...).
        root: the dataset root (``--data-dir``).
        split: the split to load.
        download: allow download (``torch/`` datasets), in which case the root need not exist yet.
        class_map: optional class-map file.
        **kwargs: further ``create_dataset`` arguments.
    """
    from timm.data import create_dataset

    folder = not name or name.lower() in ("folder", "imagefolder", "image_folder")
    if root is not None and not download and (folder or not name.startswith(("hfds/", "hfids/", "tfds/", "wds/"))):
        if not os.path.exists(root):
            raise DataError(f"data directory '{root}' does not exist")
        if folder and not os.path.isdir(root) and not root.endswith((".tar", ".tar.gz")):
            raise DataError(f"data directory '{root}' is not a directory")
    if root is None and folder:
        raise DataError("no data directory: pass --data-dir (an image folder with train/ and val/ sub-folders)")
    if class_map and not os.path.isfile(class_map):
        raise DataError(f"class map '{class_map}' does not exist")
    try:
        dataset = create_dataset(name, root=root, split=split, download=download, class_map=class_map, **kwargs)
    except (RuntimeError, FileNotFoundError, AssertionError, ValueError) as e:
        detail = " ".join(str(e).split()) or type(e).__name__
        raise DataError(f"cannot load the '{split}' split of {name or 'image folder'} '{root}': {detail}") from None
    try:
        size = len(dataset)
    except TypeError:  # iterable datasets have no length
        return dataset
    if size == 0:
        raise DataError(f"the '{split}' split of '{root}' holds no images")
    return dataset
