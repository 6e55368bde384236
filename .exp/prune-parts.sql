\timing on
SET search_path = prune_probe;
BEGIN;
LOCK TABLE ready_5, range_leases_5, range_settlements_5, tombstones_5, leases_5, settlements_5 IN ACCESS EXCLUSIVE MODE;
TRUNCATE ready_5, range_leases_5, range_settlements_5, tombstones_5, leases_5, settlements_5;
COMMIT;
BEGIN;
TRUNCATE ready_4, range_leases_4, range_settlements_4, tombstones_4, leases_4, settlements_4;
COMMIT;
BEGIN;
TRUNCATE ready_3;
COMMIT;
