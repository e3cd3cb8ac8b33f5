-- nightcrew:scope nightcrew
--
-- Named leases for when Redis is not configured (or not reachable): the same semantics as the
-- Redis locks — one holder, a token only the holder knows, a TTL that only the holder can
-- extend (replacing it, never adding to it) — plus a fencing counter that grows with every new
-- holder, so work stamped with an old fence can be refused.

CREATE TABLE nightcrew.leases (
    name       text PRIMARY KEY,
    token      text NOT NULL,
    fence      bigint NOT NULL,
    expires_at timestamptz NOT NULL
);
