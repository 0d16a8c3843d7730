"""Deprecated path of lmk.sharing.mteb_model (an export as an mteb ModelMeta with its loader):
each name resolves there, with a DeprecationWarning."""

from lmk import moved

__getattr__ = moved(__name__, "lmk.sharing.mteb_model")
