"""Capability matrices: what a device family can do, as data.

A capability file (YAML, schema ``tilecore.capabilities/v1``) describes one device
family or a family base.  Files extend each other; the registry merges them into a
read-only :class:`Capabilities` profile that backends and the conformance harness
query, e.g.::

    reg = CapabilityRegistry()
    reg.add_directory("capabilities")
    caps = reg.find("acme", arch="x1")
    caps.satisfies("limit:max_shared_bytes_per_block>=65536")

Nothing here knows any particular device; all device knowledge lives in the files.
"""

from ._errors import CapabilityError
from ._profile import DTYPE_USES, NEED_SYNTAX, Capabilities, compare_probe
from ._registry import REQUIRED_SECTIONS, CapabilityRegistry
from ._schema import SCHEMA_ID, load_schema, validate_document

__all__ = [
    "SCHEMA_ID",
    "CapabilityError",
    "Capabilities",
    "CapabilityRegistry",
    "compare_probe",
    "load_schema",
    "validate_document",
    "DTYPE_USES",
    "NEED_SYNTAX",
    "REQUIRED_SECTIONS",
]
