// Builds the dashboard into agentbolt/dashboard/ (index.html, assets/app-<hash>.js|css, favicon.svg).
// `node build.mjs --out DIR` writes there instead (to compare a fresh build with the committed one).
import { build } from "esbuild";
import { readFileSync, writeFileSync, rmSync, mkdirSync, copyFileSync } from "node:fs";
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

async function buildApp(out) {
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

const at = process.argv.indexOf("--out");
await buildApp(at > 0 ? process.argv[at + 1] : join(here, "..", "agentbolt", "dashboard"));
