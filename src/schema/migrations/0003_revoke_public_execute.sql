-- name: runtime roles: no berth function is executable by PUBLIC

-- Functions are executable by PUBLIC by default; berth's run as the schema owner, so only the
-- roles grantRuntimeRole() names may call them. Every later migration that adds a function must
-- revoke it too: per-schema default privileges cannot take PUBLIC's EXECUTE away.
REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA {{schema}} FROM PUBLIC;
