"""Run folders, the runs index, and what runs spent (alone and across an experiment)."""
