"""The conformance catalog as pytest items (collected when --tilecore-target is given)."""
import pytest

from tilecore_conformance import model
from tilecore_conformance.plugin import record
from tilecore_conformance.runner import run_case


def test_case(tc_case, tc_session):
    if tc_session.target is None:
        res = model.Result(tc_case.id, tc_case.family, {}, model.HARNESS_ERROR, "none",
                           tc_session.config.getoption("tilecore_target"), tc_case.seed, error=tc_session.error)
    else:
        res = run_case(tc_case, tc_session.target, tc_session.expect["expected_failures"], tc_session.timeout)
    record(tc_session, res)
    detail = f"{res.state} [{res.mode}] {res.error}".strip()
    if res.state == model.NOT_SUPPORTED:
        pytest.skip(detail)
    if res.state == model.EXPECTED_FAIL:
        pytest.xfail(detail)
    if res.state != model.PASS:
        pytest.fail(detail, pytrace=False)
