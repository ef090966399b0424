"""Jobs: submission (with budget reservation), the one transition function, the reaper."""
