"""The etcd key layout, in one place (see architecture.md, "etcd keys")."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Keys:
    prefix: str = "/elasticd/v1"

    def nodes(self) -> str:
        return f"{self.prefix}/nodes/"

    def node(self, node_id: str) -> str:
        return f"{self.prefix}/nodes/{node_id}"

    def jobs(self) -> str:
        return f"{self.prefix}/jobs/"

    def job(self, job_id: str) -> str:
        return f"{self.prefix}/jobs/{job_id}/"

    def job_spec(self, job_id: str) -> str:
        return f"{self.prefix}/jobs/{job_id}/spec"

    def job_status(self, job_id: str) -> str:
        return f"{self.prefix}/jobs/{job_id}/status"

    def job_desired(self, job_id: str) -> str:
        return f"{self.prefix}/jobs/{job_id}/desired"

    def job_of(self, key: str) -> tuple[str, str] | None:
        """``.../jobs/<job>/<leaf>`` -> (job, leaf)."""
        rest = key.removeprefix(self.jobs())
        job, sep, leaf = rest.partition("/")
        return (job, leaf) if sep and key.startswith(self.jobs()) else None
