// Provisional until docs/openapi.json exists.
export const API_VERSION = "1.1.0";
