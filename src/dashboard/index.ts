export { startDashboard, type DashboardServer } from './server.js';
export { createDashboardHandler, type DashboardHandler, type DashboardHandlerOptions } from './handler.js';
export {
  dashboardOptionsFromEnv,
  DASHBOARD_DEFAULTS,
  DEFAULT_DASHBOARD_HOST,
  DEFAULT_DASHBOARD_PORT,
  MIN_PASSWORD_LENGTH,
  MIN_TOKEN_LENGTH,
  type DashboardAuth,
  type DashboardEnvOptions,
  type DashboardOptions,
} from './options.js';
export type { WorkerHttpOptions, WorkerDashboardOptions } from './worker-http.js';
export { AUTH_LIMIT_DEFAULTS, type AuthLimitOptions } from './auth-limits.js';
