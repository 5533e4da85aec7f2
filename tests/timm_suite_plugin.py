"""pytest plugin that lets timm's own model test file (``tests/test_models.py`` of timm's source distribution) test
the ``wtconvnext_*`` models, as it tests timm's ConvNeXt. Not a test file of ours: ``tests/test_timm_suite.py`` runs
timm's file in a subprocess with ``-p timm_suite_plugin`` (this directory on ``PYTHONPATH``).

timm's file builds its parametrizations when pytest imports it; this plugin is loaded before that and

- imports ``wtconvnext``, which registers the models with timm, so ``list_models()`` yields them for every per-model
  test (``-k`` then selects them);
- makes ``list_models(module=[...])`` that names timm's ``convnext`` module also name ``wtconvnext``: the
  forward_intermediates and pruning tests select their models by module name and list ConvNeXt;
- gives every test that names timm's ConvNeXt explicitly (``convnext_atto``, ``test_convnext``, possibly with model
  kwargs) the same case for the WTConvNeXt of the same size (``wtconvnext_atto``, ``test_wtconvnext``): head width
  after pruning, concat pooling, pooling kept on reset, output stride, gradient checkpointing of feature models...

Nothing else of timm's file is changed.
"""

from __future__ import annotations

import functools
import os

import pytest
import timm
import torch

import wtconvnext  # noqa: F401  (registers wtconvnext_* with timm)

# timm's model name -> ours, for the tests that name ConvNeXt models explicitly.
COUNTERPARTS = {"convnext_atto": "wtconvnext_atto", "test_convnext": "test_wtconvnext"}

torch.set_num_threads(int(os.environ.get("WTCONVNEXT_TEST_THREADS", "1")))

_list_models = timm.list_models


@functools.wraps(_list_models)
def _list_models_with_wtconvnext(*args, module=None, **kwargs):
    if module:
        modules = [module] if isinstance(module, str) else list(module)
        if "convnext" in modules and "wtconvnext" not in modules:
            modules.append("wtconvnext")
        module = modules
    return _list_models(*args, module=module, **kwargs)


timm.list_models = _list_models_with_wtconvnext  # timm's file does `from timm import list_models` at import


def _counterpart(value):
    """The same parameter for our model, or None if ``value`` does not name a ConvNeXt that has one."""
    if isinstance(value, str):
        return COUNTERPARTS.get(value)
    if isinstance(value, tuple) and value and isinstance(value[0], str) and value[0] in COUNTERPARTS:
        return (COUNTERPARTS[value[0]],) + value[1:]
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Add our models' cases to parametrizations that list a ConvNeXt model by name (before pytest expands them)."""
    markers = metafunc.definition.own_markers
    for index, mark in enumerate(markers):
        if mark.name != "parametrize" or len(mark.args) < 2:
            continue
        argnames, argvalues = mark.args[0], list(mark.args[1])
        names = [n.strip() for n in argnames.split(",")] if isinstance(argnames, str) else list(argnames)
        if "model_name" not in names or mark.kwargs.get("ids") is not None:
            continue
        added = [c for c in map(_counterpart, argvalues) if c is not None and c not in argvalues]
        if added:
            markers[index] = pytest.mark.parametrize(argnames, argvalues + added, **mark.kwargs).mark
