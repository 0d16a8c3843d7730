"""Deprecated path of lmk.sharing.publish (a run -> a shareable folder (export, card, mteb results) and the hub):
each name resolves there, with a DeprecationWarning."""

from lmk import moved

__getattr__ = moved(__name__, "lmk.sharing.publish")
