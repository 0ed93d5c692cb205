"""`python -m memtrack.records`: print the run record's JSON Schema (records/schema/ holds it)."""

import json

from memtrack.records.validate import json_schema

print(json.dumps(json_schema(), indent=2))
