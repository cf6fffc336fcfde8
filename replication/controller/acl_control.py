"""ACLs and SCRAM credentials in the cluster metadata (Kafka's AclControlManager and the
controller's SCRAM control): the controller's writes of ACL bindings and salted, hashed
credentials, and the bootstrap of credentials into a metadata log before any controller runs."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Sequence
from typing import Protocol

from replication.errors import (
    DuplicateResourceError,
    InvalidRequestError,
    ReplogError,
    ResourceNotFoundError,
    StaleControllerEpochError,
)
from replication.metadata.image import MetadataImage
from replication.metadata.store import MetadataStore
from replication.security.acl import AclBinding, AclBindingFilter
from replication.security.scram import ScramCredential

#: the controller's log, where its metadata changes are told
log = logging.getLogger("replication.controller.controller")


class _MetadataWriter(Protocol):
    """What the ACL and credential writes need of the controller."""

    _lock: threading.RLock
    image: MetadataImage

    def _commit(self, image: MetadataImage, base: MetadataImage | None = None) -> MetadataImage: ...


class AclControlManager:
    """The controller's ACL and SCRAM credential writes, each one metadata version taken under
    the controller's lock."""

    def create_acls(
        self: _MetadataWriter, bindings: Sequence[AclBinding]
    ) -> list[ReplogError | None]:
        """Add ACL bindings (Kafka's CreateAcls), one result per binding: None, or why it was
        refused (InvalidRequestError). One metadata version holds them all; a binding that
        exists already is a success that changes nothing."""
        with self._lock:
            results: list[ReplogError | None] = []
            added: list[AclBinding] = []
            for binding in bindings:
                try:
                    binding.validate()
                except ReplogError as err:
                    results.append(err)
                    continue
                results.append(None)
                added.append(binding)
            existing = set(self.image.acls)
            new = [b for b in dict.fromkeys(added) if b not in existing]
            if new:
                self._commit(self.image.next().with_acls([*self.image.acls, *new]))
                for b in new:
                    log.info("ACL created: %s", describe_acl(b))
            return results

    def delete_acls(
        self: _MetadataWriter, filters: Sequence[AclBindingFilter]
    ) -> list[list[AclBinding]]:
        """Remove the ACL bindings each filter matches (Kafka's DeleteAcls); returns, per
        filter, the bindings it matched (a binding two filters match is in both). One
        metadata version holds every removal."""
        with self._lock:
            matched = [[b for b in self.image.acls if f.matches(b)] for f in filters]
            doomed = {b for found in matched for b in found}
            if doomed:
                self._commit(
                    self.image.next().with_acls(b for b in self.image.acls if b not in doomed)
                )
                for b in sorted(doomed):
                    log.info("ACL deleted: %s", describe_acl(b))
            return matched

    def alter_scram_credentials(
        self: _MetadataWriter,
        upsertions: Sequence[ScramCredential],
        deletions: Sequence[tuple[str, str]],
    ) -> dict[str, ReplogError | None]:
        """Upsert and delete SCRAM credentials (Kafka's AlterUserScramCredentials, the
        credentials already salted and hashed); one result per user, all or nothing per user:
        a user whose credential for one mechanism is named twice (DUPLICATE_RESOURCE) or who
        deletes one that does not exist (RESOURCE_NOT_FOUND) gets none of its changes. One
        metadata version holds every other user's changes."""
        with self._lock:
            results: dict[str, ReplogError | None] = {}
            seen: dict[tuple[str, str], int] = {}
            for key in [(c.user, c.mechanism) for c in upsertions] + list(deletions):
                seen[key] = seen.get(key, 0) + 1
                results.setdefault(key[0], None)
            for (user, mechanism), count in seen.items():
                if count > 1 and results[user] is None:
                    results[user] = DuplicateResourceError(
                        f"the {mechanism} credential of user {user!r} is altered more than once "
                        "in one request: send each change once"
                    )
            for user, mechanism in deletions:
                if results[user] is None and self.image.scram_credential(user, mechanism) is None:
                    results[user] = ResourceNotFoundError(
                        f"user {user!r} has no {mechanism} credential to delete"
                    )
            ok_upserts = [c for c in upsertions if results[c.user] is None]
            ok_deletions = [(u, m) for u, m in deletions if results[u] is None]
            if ok_upserts or ok_deletions:
                self._commit(self.image.next().with_scram_credentials(ok_upserts, ok_deletions))
                for c in ok_upserts:
                    log.info(
                        "SCRAM credential of user %r for %s set (%d iterations)",
                        c.user,
                        c.mechanism,
                        c.iterations,
                    )
                for user, mechanism in ok_deletions:
                    log.info("SCRAM credential of user %r for %s deleted", user, mechanism)
            return results


def describe_acl(b: AclBinding) -> str:
    """One ACL in Kafka's words: ``User:alice has ALLOW permission for operation READ from
    host * on TOPIC:LITERAL:events``."""
    return (
        f"{b.principal} has {b.permission.name} permission for operation {b.operation.name} "
        f"from host {b.host} on {b.resource_type.name}:{b.pattern_type.name}:{b.resource_name}"
    )


def bootstrap_credentials(
    store: MetadataStore,
    credentials: Iterable[ScramCredential],
    acls: Iterable[AclBinding] = (),
) -> MetadataImage:
    """Write SCRAM users (and ACLs) into the metadata of a cluster that has not started yet
    (Kafka's ``kafka-storage format --add-scram``); returns the version written.

    With SASL between brokers, a broker must authenticate to the controller before it can
    register, so its user must exist before any broker runs: nothing could create it over
    the wire. Only a metadata log no controller has claimed is written (claims are never
    pruned, so none means no controller ever ran on it): each call writes the next version,
    a full image with the credentials added (replaced by user and mechanism) and the ACLs
    added; the first controller to activate builds on it (and fills in the cluster id).
    InvalidRequestError otherwise: add users to a running cluster with
    AlterUserScramCredentials (`replog users add`)."""
    if store.latest_claim() is not None:
        raise InvalidRequestError(
            f"metadata log {store.storage.url} is in use (a controller has claimed it): add "
            "users to a running cluster with `replog users add NAME --bootstrap-server "
            "HOST:PORT`"
        )
    base = store.read_latest()
    image = base.next().with_scram_credentials(credentials)
    image = image.with_acls([*image.acls, *acls])
    try:
        written = store.write(image)
    except StaleControllerEpochError as err:
        raise InvalidRequestError(
            f"metadata log {store.storage.url}: version {image.version} was written meanwhile "
            "(another bootstrap, or a controller starting); run it again, or add users to the "
            "running cluster with `replog users add`"
        ) from err
    if store.latest_claim() is not None:
        log.warning(
            "a controller claimed %s while users were bootstrapped: check `replog users list`",
            store.storage.url,
        )
    return written
