// Generated from docs/openapi.json by `npm run generate`; do not edit.

/** The version of the Keel API this client was generated for (the OpenAPI document's `info.version`). */
export const API_VERSION = "1.5.0";
