"""The rules, one module a family of problems: each finds its problems as structured findings and
registers the words each of its reasons gets (wording.words)."""
