"""Backbones, necks and heads built on the evolution layers."""
