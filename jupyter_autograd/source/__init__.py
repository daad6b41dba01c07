"""The user's source, read with `ast` (no torch): the statements ops ran at, what they assign and
write, the names they spell, the stores that keep a tensor, and the rewrites that fixes offer."""
