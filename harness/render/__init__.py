"""Printing and rendering: the run table and the HTML/Markdown report."""
