"""User-interface front ends for trioloop sessions.

``trioloop.ui.qt`` holds the Qt review panel and the Trio guest-mode host; it needs the optional
``trioloop[qt]`` extra (PySide6), so this package imports nothing by itself and stays importable
without it.
"""

__all__: list[str] = []
