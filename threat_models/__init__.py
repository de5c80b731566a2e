"""Threat models: adversaries, their views of a transcript, and attacks.

Not implemented yet (a later issue): the package exists so the layout of the design is in
place. Nothing here is imported by :mod:`secagg`.
"""
