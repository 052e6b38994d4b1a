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

    def job_round(self, job_id: str) -> str:
        return f"{self.prefix}/jobs/{job_id}/round"

    def job_restarts(self, job_id: str) -> str:
        return f"{self.prefix}/jobs/{job_id}/restarts"

    def job_final(self, job_id: str) -> str:
        return f"{self.prefix}/jobs/{job_id}/final"

    def join(self, job_id: str, round_no: int, node: str) -> str:
        return f"{self.prefix}/jobs/{job_id}/rdzv/{round_no}/join/{node}"

    def joins(self, job_id: str, round_no: int) -> str:
        return f"{self.prefix}/jobs/{job_id}/rdzv/{round_no}/join/"

    def result(self, job_id: str, round_no: int) -> str:
        return f"{self.prefix}/jobs/{job_id}/rdzv/{round_no}/result"

    def done(self, job_id: str, round_no: int, node: str) -> str:
        return f"{self.prefix}/jobs/{job_id}/rdzv/{round_no}/done/{node}"

    def left(self, job_id: str, round_no: int, node: str) -> str:
        return f"{self.prefix}/jobs/{job_id}/rdzv/{round_no}/left/{node}"

    def rounds(self, job_id: str, round_no: int) -> str:
        return f"{self.prefix}/jobs/{job_id}/rdzv/{round_no}/"

    def waiting(self, job_id: str, node: str) -> str:
        return f"{self.prefix}/jobs/{job_id}/waiting/{node}"

    def node_status(self, job_id: str, node: str) -> str:
        return f"{self.prefix}/jobs/{job_id}/nodes/{node}"

    def pending_note(self, job_id: str, node: str) -> str:
        return f"{self.prefix}/jobs/{job_id}/pending/{node}"

    def drains(self) -> str:
        return f"{self.prefix}/drain/"

    def drain(self, node: str) -> str:
        return f"{self.prefix}/drain/{node}"

    def job_drain(self, job_id: str, node: str) -> str:
        return f"{self.prefix}/jobs/{job_id}/drain/{node}"

    def job_of(self, key: str) -> tuple[str, str] | None:
        """``.../jobs/<job>/<rest>`` -> (job, rest)."""
        rest = key.removeprefix(self.jobs())
        job, sep, leaf = rest.partition("/")
        return (job, leaf) if sep and key.startswith(self.jobs()) else None
