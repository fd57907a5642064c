// Minimal lint without a toolchain download: every setting the extension reads is
// declared in package.json, and every declared command is registered in extension.js.
'use strict';
const fs = require('fs');
const pkg = JSON.parse(fs.readFileSync(__dirname + '/package.json', 'utf8'));
const src = ['extension.js', 'nextedit.js'].map((f) => fs.readFileSync(__dirname + '/' + f, 'utf8')).join('\n');
const props = Object.keys(pkg.contributes.configuration.properties).map((k) => k.split('.')[1]);
const used = [...src.matchAll(/get\('([A-Za-z]+)'\)/g)].map((m) => m[1]);
const problems = [];
for (const u of used) if (!props.includes(u)) problems.push(`setting fimls.${u} is read but not declared`);
for (const c of pkg.contributes.commands) {
  if (!src.includes(`'${c.command}'`)) problems.push(`command ${c.command} is declared but not registered`);
}
if (problems.length) { console.error(problems.join('\n')); process.exit(1); }
console.log(`lint ok: ${used.length} settings read, ${pkg.contributes.commands.length} commands`);
