// Builds the dashboard into agentbolt/dashboard/ (index.html, assets/app-<hash>.js|css, favicon.svg).
// `node build.mjs --tests` bundles tests/*.test.ts into build/tests/ for `node --test` instead.
import { build } from "esbuild";
import { readFileSync, writeFileSync, rmSync, mkdirSync, readdirSync, copyFileSync } from "node:fs";
import { basename, dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const common = {
  bundle: true,
  jsx: "automatic",
  jsxImportSource: "preact",
  target: "es2020",
  legalComments: "none",
  logLevel: "warning",
};

async function buildTests() {
  const dir = join(here, "tests");
  const entryPoints = readdirSync(dir).filter((f) => f.endsWith(".test.ts")).map((f) => join(dir, f));
  rmSync(join(here, "build"), { recursive: true, force: true });
  await build({ ...common, entryPoints, outdir: join(here, "build", "tests"), platform: "node", format: "esm", outExtension: { ".js": ".mjs" } });
}

async function buildApp() {
  const out = join(here, "..", "agentbolt", "dashboard");
  rmSync(out, { recursive: true, force: true });
  mkdirSync(join(out, "assets"), { recursive: true });
  const result = await build({
    ...common,
    entryPoints: { app: join(here, "src", "main.tsx") },
    outdir: join(out, "assets"),
    entryNames: "[name]-[hash]",
    format: "esm",
    minify: true,
    metafile: true,
    charset: "utf8",
  });
  const outputs = Object.keys(result.metafile.outputs).map((p) => basename(p));
  const js = outputs.find((f) => f.endsWith(".js"));
  const css = outputs.find((f) => f.endsWith(".css"));
  const template = readFileSync(join(here, "src", "index.html"), "utf8");
  writeFileSync(join(out, "index.html"), template.replace("%APP_JS%", `assets/${js}`).replace("%APP_CSS%", `assets/${css}`));
  copyFileSync(join(here, "src", "favicon.svg"), join(out, "favicon.svg"));
  console.log(`dashboard built: ${js}, ${css}`);
}

if (process.argv.includes("--tests")) await buildTests();
else await buildApp();
