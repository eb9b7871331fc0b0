"""The lookup_knowledge tool definition handed to an agent (no store, no model)."""

import json

from rag_core.lookup.tool import tool_definition


def test_tool_definition_is_a_json_schema_function():
    d = tool_definition()
    fn = d["function"]
    assert d["type"] == "function" and fn["name"] == "lookup_knowledge"
    assert fn["parameters"]["required"] == ["query"] and fn["parameters"]["properties"]["query"]["type"] == "string"
    assert "contextPack" in fn["description"] and "evidenceBlocks" in fn["description"]
    assert json.loads(json.dumps(d)) == d  # plain JSON, as sent to the model API
