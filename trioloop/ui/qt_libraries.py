"""The system libraries Qt needs on Linux, and what to tell a person when one is missing.

PySide6 ships Qt itself but not the system libraries Qt links to (EGL, OpenGL, xkbcommon, fontconfig,
D-Bus; xcb-cursor and friends for an X11 display). When one is absent, importing PySide6 fails with the
loader's terse "libEGL.so.1: cannot open shared object file", and a missing platform-plugin library makes
Qt abort the whole process when the QApplication is created. This module turns such an error text into a
sentence that names the library and the Debian package that provides it, and can check the platform's
libraries before Qt is started. It imports nothing from Qt, so it works exactly when Qt does not.
"""

from __future__ import annotations

import ctypes
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Final, final

import attrs

__all__ = [
    "INSTALL_COMMAND",
    "QT_PACKAGES",
    "XCB_INSTALL_COMMAND",
    "XCB_PACKAGES",
    "MissingLibrary",
    "QtUnavailable",
    "debian_package",
    "missing_libraries_advice",
    "missing_library",
    "missing_qt_libraries",
    "qt_import_failure",
    "qt_start_advice",
    "require_qt_libraries",
]

#: Library file -> Debian package, for every library the Qt 6 wheels link to that a slim system may lack.
_PACKAGES: Final[Mapping[str, str]] = MappingProxyType(
    {
        "libEGL.so.1": "libegl1",
        "libGL.so.1": "libgl1",
        "libOpenGL.so.0": "libopengl0",
        "libGLX.so.0": "libglx0",
        "libxkbcommon.so.0": "libxkbcommon0",
        "libxkbcommon-x11.so.0": "libxkbcommon-x11-0",
        "libfontconfig.so.1": "libfontconfig1",
        "libfreetype.so.6": "libfreetype6",
        "libdbus-1.so.3": "libdbus-1-3",
        "libglib-2.0.so.0": "libglib2.0-0",
        "libgthread-2.0.so.0": "libglib2.0-0",
        "libX11.so.6": "libx11-6",
        "libX11-xcb.so.1": "libx11-xcb1",
        "libxcb.so.1": "libxcb1",
        "libxcb-cursor.so.0": "libxcb-cursor0",
        "libxcb-icccm.so.4": "libxcb-icccm4",
        "libxcb-image.so.0": "libxcb-image0",
        "libxcb-keysyms.so.1": "libxcb-keysyms1",
        "libxcb-render-util.so.0": "libxcb-render-util0",
        "libxcb-util.so.1": "libxcb-util1",
        "libxcb-randr.so.0": "libxcb-randr0",
        "libxcb-render.so.0": "libxcb-render0",
        "libxcb-shape.so.0": "libxcb-shape0",
        "libxcb-shm.so.0": "libxcb-shm0",
        "libxcb-sync.so.1": "libxcb-sync1",
        "libxcb-xfixes.so.0": "libxcb-xfixes0",
        "libxcb-xkb.so.1": "libxcb-xkb1",
    }
)
#: What the preflight loads: QtGui's and QtWidgets' own libraries, and the xcb plugin's on an X11 display.
_QT_LIBRARIES: Final = ("libEGL.so.1", "libGL.so.1", "libxkbcommon.so.0", "libfontconfig.so.1", "libdbus-1.so.3")
_XCB_LIBRARIES: Final = (
    "libxcb-cursor.so.0",
    "libxkbcommon-x11.so.0",
    "libX11-xcb.so.1",
    "libxcb-icccm.so.4",
    "libxcb-image.so.0",
    "libxcb-keysyms.so.1",
    "libxcb-render-util.so.0",
    "libxcb-shape.so.0",
    "libxcb-xkb.so.1",
)

#: The Debian packages of the libraries above: the one list the advice, the docs and the preflight share.
#: ``QT_PACKAGES`` for any display (the "offscreen" platform included), ``XCB_PACKAGES`` as well for X11.
QT_PACKAGES: Final = tuple(dict.fromkeys(_PACKAGES[library] for library in _QT_LIBRARIES))
XCB_PACKAGES: Final = tuple(dict.fromkeys(_PACKAGES[library] for library in _XCB_LIBRARIES))
INSTALL_COMMAND: Final = "apt-get install -y " + " ".join(QT_PACKAGES)
XCB_INSTALL_COMMAND: Final = "apt-get install -y " + " ".join(XCB_PACKAGES)

# "libEGL.so.1: cannot open shared object file", "libxkbcommon-x11.so.0 => not found" (ldd, QT_DEBUG_PLUGINS).
_LIBRARY_FILE: Final = re.compile(r"\b(lib[A-Za-z0-9_+-]+(?:[.-][0-9]+)*\.so(?:\.[0-9]+)*)")
# Qt 6.5+: "From 6.5.0, xcb-cursor0 or libxcb-cursor0 is needed to load the Qt xcb platform plugin."
# Qt's and PySide6's own files ("Cannot load library .../libqxcb.so: (libxcb-cursor.so.0: ...)") are not the culprit.
_SHIPPED: Final = re.compile(r"lib(?:Qt\d|q[a-z]|pyside|shiboken)", re.IGNORECASE)
_QT_NEEDS_PACKAGE: Final = re.compile(r"\b(?:lib)?(xcb-cursor)0\b[^\n]*\bis needed\b")
_PLATFORM_PLUGIN: Final = re.compile(r'Qt platform plugin "([^"]+)"|no Qt platform plugin could be initialized')


@final
class QtUnavailable(RuntimeError):
    """Qt cannot start on this system; the message names what is missing and what to install."""


@final
@attrs.frozen(kw_only=True)
class MissingLibrary:
    """A system library Qt could not load, and the Debian package that provides it.

    ``known`` is False when the package name is only derived by Debian's library naming rule (then the
    advice says how to confirm it)."""

    library: str
    package: str
    known: bool = True


def debian_package(library: str) -> MissingLibrary:
    """The Debian package of the library file ``library`` ("libEGL.so.1" -> "libegl1").

    A library not in the table gets Debian's naming rule (policy 8.1: the name and the soname version,
    lowercased, with a hyphen when the name ends in a digit), marked not ``known``."""
    package = _PACKAGES.get(library)
    if package is not None:
        return MissingLibrary(library=library, package=package)
    name, _, version = library.partition(".so")
    version = version.lstrip(".").split(".")[0]
    separator = "-" if name[-1:].isdigit() and version else ""
    return MissingLibrary(library=library, package=f"{name}{separator}{version}".lower(), known=False)


def missing_library(error: str) -> MissingLibrary | None:
    """The library an error text from the loader, PySide6 or Qt's platform plugin says is missing, if any."""
    for named in _LIBRARY_FILE.finditer(error):
        if _SHIPPED.match(named.group(1)) is None:
            return debian_package(named.group(1))
    if _QT_NEEDS_PACKAGE.search(error) is not None:
        return debian_package("libxcb-cursor.so.0")
    return None


def qt_start_advice(error: str) -> str | None:
    """What to tell a person for ``error`` (a PySide6 import error or Qt's start-up output): the missing
    library, the Debian package and the command that installs it; None if ``error`` is not such a failure."""
    library = missing_library(error)
    plugin = _PLATFORM_PLUGIN.search(error)
    if library is not None:
        confirm = "" if library.known else f" (the name follows Debian's rule; `apt-file search {library.library}`)"
        lines = [
            f"Qt cannot start: the system library {library.library} is missing.",
            f"On Debian or Ubuntu it is in the package {library.package}{confirm}; as root: "
            f"apt-get install -y {library.package}",
        ]
    elif plugin is not None:
        name = plugin.group(1) or "xcb"
        lines = [
            f'Qt cannot start: its "{name}" platform plugin did not load, so a library it needs is missing.',
            f"For an X11 display that is most often libxcb-cursor0; as root: {XCB_INSTALL_COMMAND}",
            "Run again with QT_DEBUG_PLUGINS=1 to see the library Qt lacks; "
            "QT_QPA_PLATFORM=offscreen runs without any display.",
        ]
    else:
        return None
    lines.append(f"Everything the Qt panel needs: {INSTALL_COMMAND}, and {' '.join(XCB_PACKAGES)} for X11.")
    return "\n".join(lines)


def qt_import_failure(exc: ImportError) -> str:
    """The message for an ImportError raised while importing PySide6: the missing system library and its
    package, or the missing Qt extra."""
    advice = qt_start_advice(str(exc))
    if advice is not None:
        return advice
    return f'trioloop.ui.qt needs the Qt extra: pip install "trioloop[qt]" ({exc})'


def _platform() -> str | None:
    """The platform plugin Qt will try first on this system (None off Linux: Qt's own plugins need nothing)."""
    if not sys.platform.startswith("linux"):
        return None
    chosen = os.environ.get("QT_QPA_PLATFORM", "").split(";")[0].split(":")[0].strip()
    if chosen:
        return chosen
    return "wayland" if os.environ.get("WAYLAND_DISPLAY") else "xcb"


def _loads(library: str) -> bool:
    try:
        ctypes.CDLL(library)
    except OSError:
        return False
    return True


def missing_qt_libraries(
    platform: str | None = None, *, loads: Callable[[str], bool] | None = None
) -> tuple[MissingLibrary, ...]:
    """The system libraries Qt needs for ``platform`` (default: the plugin Qt will pick, from
    ``QT_QPA_PLATFORM`` or the session) that cannot be loaded; empty off Linux.

    Call it before creating the QApplication: Qt aborts the process when its platform plugin fails.
    ``loads`` (default: whether ``ctypes`` can load the library file) is for tests."""
    if platform is None:
        platform = _platform()
        if platform is None:
            return ()
    wanted = _QT_LIBRARIES + (_XCB_LIBRARIES if platform == "xcb" else ())
    loads = _loads if loads is None else loads
    return tuple(debian_package(library) for library in wanted if not loads(library))


def missing_libraries_advice(missing: Sequence[MissingLibrary]) -> str:
    """What to tell a person when the libraries ``missing`` (from `missing_qt_libraries`) cannot be loaded."""
    named = ", ".join(f"{m.library} (package {m.package})" for m in missing)
    packages = " ".join(dict.fromkeys(m.package for m in missing))
    return (
        f"Qt cannot start: the system libraries it needs are missing: {named}.\n"
        f"On Debian or Ubuntu, as root: apt-get install -y {packages}\n"
        f"Everything the Qt panel needs: {INSTALL_COMMAND}, and {' '.join(XCB_PACKAGES)} for X11."
    )


def require_qt_libraries(platform: str | None = None, *, loads: Callable[[str], bool] | None = None) -> None:
    """Raise `QtUnavailable`, naming the libraries and packages, when `missing_qt_libraries` finds any."""
    missing = missing_qt_libraries(platform, loads=loads)
    if missing:
        raise QtUnavailable(missing_libraries_advice(missing))
