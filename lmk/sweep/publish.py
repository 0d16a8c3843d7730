"""Deprecated path of lmk.sharing.push_rows (a built table's finished rows to the hub):
each name resolves there, with a DeprecationWarning."""

from lmk import moved

__getattr__ = moved(__name__, "lmk.sharing.push_rows")
