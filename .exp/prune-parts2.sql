\timing on
SET search_path = prune_probe;
BEGIN;
TRUNCATE ready_7, range_leases_7, range_settlements_7;
COMMIT;
BEGIN;
TRUNCATE ready_8, range_leases_8, range_settlements_8, tombstones_8, leases_8, settlements_8;
COMMIT;
BEGIN;
TRUNCATE ready_9, range_leases_9, range_settlements_9;
COMMIT;
BEGIN;
TRUNCATE ready_10, range_leases_10, range_settlements_10, tombstones_10, leases_10, settlements_10;
COMMIT;
