"""What an experiment is: agl.yaml read and checked, its variants, tasks, prices and the user's volume."""
