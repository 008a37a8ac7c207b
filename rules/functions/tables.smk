# The tables stage's functions (rules/tables.smk).


def table_files(wildcards=None):
    """Every table's CSV (the inputs of the rules that read the tables)."""
    return expand(f"{R}/tables/{{name}}.csv", name=TABLES)
