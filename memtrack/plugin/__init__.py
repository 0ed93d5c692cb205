"""The pytest plugin: memory budgets on tests (`@pytest.mark.memory_budget`), and every test
measured and recorded as a case of one run with `--memtrack`. Loaded by pytest through the
`pytest11` entry point; inert unless a test carries a budget or `--memtrack` is given."""
