"""Claims a researcher declares, judged like the papers': a measure of the
registry (measures.py) on the variants a selector picks, against a
comparison, with a seed-level CI, the planted control of its measure and
its detection floor (judge.py).  The papers' ten claims are two shipped
claim files (paper_a.yaml, paper_b.yaml) read by the same judge."""
