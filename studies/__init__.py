"""Many runs of one job script: array tasks, study files (recipes x seeds, shapes x strategies x repeats) and the
one report that compares any set of runs (bert-squad-compare). Nothing here is imported by a training run."""
