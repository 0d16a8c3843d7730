"""Deprecated path of lmk.sharing.command (the command behind `python -m lmk.export`):
each name resolves there, with a DeprecationWarning."""

from lmk import moved

__getattr__ = moved(__name__, "lmk.sharing.command")
