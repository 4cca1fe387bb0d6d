"""The conformance catalog as pytest items (collected when --tilecore-target is given)."""
import pytest

from tilecore_conformance import model
from tilecore_conformance.plugin import record


def pytest_generate_tests(metafunc):
    if "tc_case" in metafunc.fixturenames:
        sess = getattr(metafunc.config, "_tilecore", None)
        if sess is None:
            pytest.skip("the conformance suite needs --tilecore-target=<target>")  # only when run by path by hand
        metafunc.parametrize("tc_case", sess.cases, ids=[c.id for c in sess.cases])


@pytest.fixture
def tc_session(request):
    return request.config._tilecore


def test_case(tc_case, tc_session):
    res = tc_session.run(tc_case)  # a target that cannot be resolved stopped the run in pytest_configure
    record(tc_session, res)
    detail = f"{res.state} [{res.mode}] {res.error}".strip()
    if res.state == model.NOT_SUPPORTED:
        pytest.skip(detail)
    if res.state == model.EXPECTED_FAIL:
        pytest.xfail(detail)
    if res.state != model.PASS:
        pytest.fail(detail, pytrace=False)
