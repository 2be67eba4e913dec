// Generates src/generated/ from the API's OpenAPI document
// (docs/openapi.json): the types, with openapi-typescript, and the API
// version the client speaks (the document's info.version).
//
//   node scripts/generate.mjs           writes the files
//   node scripts/generate.mjs --check   fails when the committed files differ
//                                       from a fresh generation

import { readFile, writeFile } from "node:fs/promises";
import { fileURLToPath } from "node:url";

import openapiTS, { COMMENT_HEADER, astToString } from "openapi-typescript";

const documentPath = fileURLToPath(new URL("../../../docs/openapi.json", import.meta.url));
const outputs = {
  types: fileURLToPath(new URL("../src/generated/openapi.ts", import.meta.url)),
  version: fileURLToPath(new URL("../src/generated/version.ts", import.meta.url)),
};
const SOURCE = "Generated from docs/openapi.json by `npm run generate`; do not edit.";

const document = JSON.parse(await readFile(documentPath, "utf8"));
if (typeof document.info?.version !== "string") {
  throw new Error(`${documentPath} has no info.version`);
}

const generated = {
  types: `${COMMENT_HEADER}// ${SOURCE}\n\n${astToString(await openapiTS(document, { silent: true }))}`,
  version: [
    `// ${SOURCE}`,
    "",
    "/** The version of the Keel API this client was generated for (the OpenAPI document's `info.version`). */",
    `export const API_VERSION = ${JSON.stringify(document.info.version)};`,
    "",
  ].join("\n"),
};

if (process.argv.includes("--check")) {
  const stale = [];
  for (const [name, path] of Object.entries(outputs)) {
    const committed = await readFile(path, "utf8").catch(() => "");
    if (committed !== generated[name]) {
      stale.push(path);
    }
  }
  if (stale.length > 0) {
    console.error(`out of date with docs/openapi.json: ${stale.join(", ")}\nrun \`npm run generate\` and commit the result`);
    process.exit(1);
  }
  console.log("src/generated/ matches docs/openapi.json");
} else {
  for (const [name, path] of Object.entries(outputs)) {
    await writeFile(path, generated[name]);
  }
  console.log(`wrote ${Object.values(outputs).join(", ")}`);
}
