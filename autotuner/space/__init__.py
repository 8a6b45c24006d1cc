"""The search space: which engine options a study tunes, and over which values.

Each engine declares its options in ``search_spaces/<engine>.yaml`` (schema: that folder's
README). :func:`load_space` resolves the declaration for one context -- engine version, device,
GPU count, compute capability, CPU flags, whether lossy settings are allowed, the SLA's
``search`` overrides and its fixed ``engine.params`` -- into a :class:`SearchSpace`:

* ``params``: the tuned parameters with their effective ranges or choices, in file order;
* ``fixed``: options always passed: the SLA's ``engine.params``, override pins, hardware pins;
* ``dropped``: every option or choice left out, with the reason (for ``describe``).

A candidate is ``space.candidate(space.suggest(trial))`` = ``{**fixed, **suggested}``; an option
neither fixed nor suggested is left to the engine (no flag). ``baseline()`` is the engine's own
defaults: the fixed options only.

Conditions: a parameter with ``when`` is suggested only if each named parameter's value --
suggested in this trial, else fixed, else its declared default -- is in the listed set (or not
in it, for ``{not: [...]}``). Parents come first in the file, so one pass decides. Conditions
that depend only on untuned parameters are decided at load time.

The modules, each importing only those above it in this list:

* ``values``: parameter value types and how they compare;
* ``errors``: :class:`SpaceError`;
* ``versions``: version numbers and specifiers (:func:`parse_version`, :func:`version_in`);
* ``overrides``: the SLA's ``search:`` section (:class:`SearchSpec`, :class:`ParamOverride`);
* ``schema``: a space file's declarations as pydantic models (private);
* ``conditions``, ``strategy``: :class:`Condition`; priors, hopeless and monotone rules;
* ``resolved``: :class:`SearchSpace` and :class:`ParamSpec` (suggest, hash, describe);
* ``check``: consistency checks of a parsed file;
* ``files``: finding and reading space files (:func:`space_file`, :func:`newest_declarations`);
* ``context``, ``resolve``: the context resolved for and the resolution itself;
* ``load``: :func:`load_space` and :func:`load_space_for`.
"""

from autotuner.space.conditions import Condition
from autotuner.space.errors import SpaceError
from autotuner.space.files import (
    DeclaredOptions,
    newest_declarations,
    read_space_file,
    space_file,
    spaces_dir,
)
from autotuner.space.load import load_space, load_space_for
from autotuner.space.overrides import Override, ParamOverride, SearchSpec
from autotuner.space.resolved import Dropped, ParamSpec, SearchSpace
from autotuner.space.strategy import BINDING, MEASURED, ByLimit, Hopeless, Monotone, Prior
from autotuner.space.values import Device, ParamType, ParamValue
from autotuner.space.versions import parse_version, version_in

__all__ = [
    "BINDING",
    "MEASURED",
    "ByLimit",
    "Condition",
    "DeclaredOptions",
    "Device",
    "Dropped",
    "Hopeless",
    "Monotone",
    "Override",
    "ParamOverride",
    "ParamSpec",
    "ParamType",
    "ParamValue",
    "Prior",
    "SearchSpace",
    "SearchSpec",
    "SpaceError",
    "load_space",
    "load_space_for",
    "newest_declarations",
    "parse_version",
    "read_space_file",
    "space_file",
    "spaces_dir",
    "version_in",
]
