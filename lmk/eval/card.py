"""Deprecated path of lmk.sharing.card (the model card of a published run):
each name resolves there, with a DeprecationWarning."""

from lmk import moved

__getattr__ = moved(__name__, "lmk.sharing.card")
