"""Turning a Trace into pictures and text: layout (networkx), drawing (matplotlib), reports."""
