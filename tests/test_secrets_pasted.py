"""The one scrubber of what agents paste (rag_core.secrets.scrub_pasted), on alert payloads,
headers and logs of the shape agents send, and its use by every trace row."""

from __future__ import annotations

import json

from rag_core.secrets import scrub_pasted
from rag_core.traces.rows import TraceRow

JWT = (
    "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9"
    + ".eyJzdWIiOiJvbmNhbGwtYm90IiwiaWF0IjoxNzAwMDAwMDAwfQ"
    + ".Qm9ndXNTaWduYXR1cmVGb3JUZXN0cw"
)
GITHUB = "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"
AWS_KEY_ID = "AKIA" + "QWERTYUIOPASDFGH"
SLACK = "xoxb-" + "123456789012-abcdefghijklmnop"
DB_PASSWORD = "S3cr3t-Orders-Pw"
API_KEY = "9f8e7d6c5b4a39281706f5e4d3c2b1a0"
EMAIL = "jane.doe@payments.example.com"
IP = "10.42.7.19"

ALERTMANAGER = json.dumps(
    {
        "receiver": "aiops-agent",
        "status": "firing",
        "alerts": [
            {
                "labels": {"alertname": "KubePodCrashLooping", "namespace": "payments", "pod": "orders-api-7d9f"},
                "annotations": {
                    "description": f"container orders-api restarting; DATABASE_URL=postgresql://orders:{DB_PASSWORD}@{IP}:5432/orders",
                    "runbook_url": "https://runbooks.example.com/KubePodCrashLooping",
                },
            }
        ],
        "commonLabels": {"team": "payments", "owner": EMAIL},
        "webhook_config": {"api_key": API_KEY, "http_config": {"authorization": {"credentials": SLACK}}},
    }
)
CURL = f'curl -H "Authorization: Bearer {JWT}" -H "X-Api-Key: {API_KEY}" https://orders.internal/health'
LOG = f'level=error msg="git clone failed" token={GITHUB} aws_access_key_id={AWS_KEY_ID} user={EMAIL} host={IP}'
SECRETS = [JWT, GITHUB, AWS_KEY_ID, SLACK, DB_PASSWORD, API_KEY, EMAIL]


def test_secrets_and_addresses_in_pasted_payloads_are_scrubbed_and_the_question_is_kept():
    for text in (ALERTMANAGER, CURL, LOG):
        clean = scrub_pasted(text)
        assert [s for s in SECRETS if s in clean] == [], clean
    clean = scrub_pasted(ALERTMANAGER)
    assert "KubePodCrashLooping" in clean and "orders-api" in clean and "<email>" in clean
    assert IP in clean  # IPs are kept unless configured
    assert IP not in scrub_pasted(ALERTMANAGER, ips=True) and IP not in scrub_pasted(LOG, ips=True)


def test_ordinary_questions_pass_unchanged():
    for text in (
        "How do I rotate the API key of the payments service?",
        "tokens: 512 max; why is the embedding truncated",
        "KubeAPIErrorBudgetBurn firing in prod, what to check first",
        "证书过期 告警 怎么处理",
    ):
        assert scrub_pasted(text) == text


def test_a_trace_row_stores_no_pasted_secret():
    row = TraceRow(input=CURL + "\n" + LOG, retrieval_details={"attempts": [{"query": ALERTMANAGER}]})
    stored = row.model_dump_json()
    assert [s for s in SECRETS if s in stored] == []
