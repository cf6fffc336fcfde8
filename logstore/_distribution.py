"""replog's top-level packages are replog's: an ImportError, naming the other distribution,
when another one installed a package of the same name.

``logstore``, ``replication`` and ``datasource`` are generic names that other distributions
on PyPI install too. pip puts two distributions with the same top-level package into one
directory without a word (pypa/pip#4625), one overwriting or mixing with the other's files;
an uninstall of either then deletes files the other needs. Each of the three packages calls
:func:`check_installation` when it is imported; the first call in a process checks all three:

- every one of them imports from the directory this package sits in: no other copy (another
  distribution, a directory of that name in the current directory) comes first on sys.path;
- in an installed replog (a ``replog-*.dist-info`` beside the packages), their directories
  hold only files replog's RECORD lists (``__pycache__`` aside), and each ``__init__.py`` has
  the size RECORD gives it: another distribution installed into the same directory adds
  files, or replaced an ``__init__.py``.

A source checkout (an editable install, PYTHONPATH) gets the first check only: pip never
writes into a checkout, and whichever copy Python imports is checked.

The check reads one RECORD and lists the packages' directories (a fraction of a
millisecond); it reads no other distribution's metadata unless something is wrong, and then
only to name the distribution responsible (importlib.metadata.packages_distributions() reads
them all: hundreds of milliseconds in a site-packages of 150 distributions, and importing
importlib.metadata alone costs more than this whole check).
"""

from __future__ import annotations

import importlib.util
import os
import sys

#: replog's top-level packages (pyproject.toml's packages.find).
PACKAGES = ("logstore", "replication", "datasource")

#: The directory holding the three packages: site-packages, or the source checkout.
ROOT = os.path.normcase(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_REMEDY = (
    "Install replog in a virtualenv of its own (python -m venv /opt/replog && "
    "/opt/replog/bin/pip install replog), without that distribution"
)

_checked = False


def check_installation() -> None:
    """Raise ImportError if one of replog's top-level packages is not replog's (once per
    process: the first of the three packages to be imported checks all three)."""
    global _checked
    if _checked:
        return
    problem = _shadowed() or _foreign_files()
    if problem is not None:
        raise ImportError(problem)
    _checked = True


def _same_dir(a: str, b: str) -> bool:
    if os.path.normcase(os.path.abspath(a)) == os.path.normcase(b):
        return True
    return os.path.normcase(os.path.realpath(a)) == os.path.normcase(os.path.realpath(b))


def _shadowed() -> str | None:
    """What imports instead of one of replog's packages, if anything."""
    for name in PACKAGES:
        module = sys.modules.get(name)
        if module is not None:
            origin = getattr(module, "__file__", None)
        else:
            spec = importlib.util.find_spec(name)
            origin = spec.origin if spec is not None else None
        if origin is None:  # a namespace portion: a regular package always wins over it
            continue
        where = os.path.dirname(origin)
        if os.path.basename(origin).startswith("__init__."):
            where = os.path.dirname(where)
        if not _same_dir(where, ROOT):
            found = os.path.join(where, name)
            owners = _claimants(where, name)
            return (
                f"the top-level package {name!r} imports from {found} "
                f"({_describe(owners)}), not from replog ({os.path.join(ROOT, name)}): "
                f"another package of that name comes first on sys.path. {_REMEDY}, or take "
                f"{where} off sys.path (PYTHONPATH, the current directory)."
            )
    return None


def _own_record() -> list[str] | None:
    """The lines of replog's RECORD beside the packages; None in a source checkout."""
    try:
        entries = os.listdir(ROOT)
    except OSError:
        return None
    for entry in entries:
        if entry.startswith("replog-") and entry.endswith(".dist-info"):
            try:
                with open(os.path.join(ROOT, entry, "RECORD"), encoding="utf-8") as f:
                    return f.read().splitlines()
            except OSError:
                return None
    return None


def _foreign_files() -> str | None:
    """In an installed replog: files in the packages' directories that replog did not install,
    or an ``__init__.py`` that is not replog's."""
    record = _own_record()
    if record is None:
        return None
    sizes: dict[str, str] = {}
    for line in record:
        path, _, rest = line.partition(",")
        sizes[path] = rest.rpartition(",")[2]
    for name in PACKAGES:
        init = f"{name}/__init__.py"
        foreign = [init] if not _size_is(init, sizes.get(init)) else []
        foreign += [path for path in _files_under(name) if path not in sizes]
        if foreign:
            owners = _claimants(ROOT, name, foreign)
            shown = ", ".join(foreign[:3]) + (", ..." if len(foreign) > 3 else "")
            return (
                f"replog's package {name!r} in {ROOT} holds files replog did not install "
                f"({shown}): {_describe(owners)} installed a package of the same name into "
                f"the same directory, and pip mixes the two without a warning. {_REMEDY}; "
                "here, uninstall both and reinstall replog."
            )
    return None


def _size_is(path: str, size: str | None) -> bool:
    try:
        return size is not None and os.stat(os.path.join(ROOT, path)).st_size == int(size)
    except (OSError, ValueError):
        return False


def _files_under(name: str) -> list[str]:
    """Every file below ``ROOT/name`` but in ``__pycache__``, as RECORD spells paths."""
    out: list[str] = []
    stack = [name]
    while stack:
        rel = stack.pop()
        try:
            with os.scandir(os.path.join(ROOT, rel)) as entries:
                for entry in entries:
                    path = f"{rel}/{entry.name}"
                    if entry.is_dir(follow_symlinks=False):
                        if entry.name != "__pycache__":
                            stack.append(path)
                    else:
                        out.append(path)
        except OSError:
            continue
    return out


def _describe(owners: list[str]) -> str:
    if not owners:
        return "no installed distribution lists it: a stray directory or a copy"
    return "the distribution " + " and ".join(repr(o) for o in owners)


def _claimants(directory: str, name: str, paths: list[str] | None = None) -> list[str]:
    """The distributions in ``directory`` other than replog whose top_level.txt names
    ``name`` or whose RECORD lists one of ``paths`` (or any file under ``name``). Read only
    when a check failed."""
    owners: list[str] = []
    try:
        entries = sorted(os.listdir(directory))
    except OSError:
        return owners
    for entry in entries:
        if not entry.endswith((".dist-info", ".egg-info")) or entry.startswith("replog-"):
            continue
        meta = os.path.join(directory, entry)
        tops = _read_lines(os.path.join(meta, "top_level.txt"))
        files = {line.partition(",")[0] for line in _read_lines(os.path.join(meta, "RECORD"))}
        claims = name in tops or (
            any(p in files for p in paths)
            if paths
            else any(f.startswith(f"{name}/") for f in files)
        )
        if claims:
            owners.append(_dist_name(meta, entry))
    return owners


def _read_lines(path: str) -> list[str]:
    try:
        with open(path, encoding="utf-8") as f:
            return [line.strip() for line in f if line.strip()]
    except OSError:
        return []


def _dist_name(meta: str, entry: str) -> str:
    for line in _read_lines(os.path.join(meta, "METADATA")) or _read_lines(
        os.path.join(meta, "PKG-INFO")
    ):
        if line.startswith("Name:"):
            return line.partition(":")[2].strip()
    return entry.split("-", 1)[0]
