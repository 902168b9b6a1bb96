"""Ways to present events: text lines in the seed tool's layout, JSON Lines, ..."""
