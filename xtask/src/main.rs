//! `cargo xtask gen`: writes the files generated from the code —
//! `ffi-c/include/cxlkv.h` (cbindgen over ffi-c, with the result-code enum
//! from platform's table), the `Result` list of the Python stub and its
//! `Region.format` keywords (core's capacity table) and `Node.start_tier`
//! keywords (platform's tier option table). The test
//! command runs it and fails when a committed file differs.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use cxlkv_platform::Code;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let r = match args.first().map(String::as_str) {
        Some("gen") => header(&root).and_then(|()| stub(&root)),
        _ => Err("usage: cargo xtask gen".into()),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The stub's `Region.format` signature: a keyword per capacity of core's
/// table (`Capacities::FIELDS`), in its order.
fn stub_format(text: &str) -> Result<String, String> {
    let head = "    def format(\n        self,\n        *,\n        flush_mode: str = \"auto\",\n";
    let start = text.find(head).ok_or("the stub has no Region.format")? + head.len();
    let end = text[start..].find("    ) -> None: ...").map(|i| start + i).ok_or("Region.format does not end")?;
    let params: String = cxlkv_platform::kv::Capacities::FIELDS
        .iter()
        .map(|f| format!("        {}: Optional[int] = None,\n", f.name))
        .collect();
    Ok(format!("{}{}{}", &text[..start], params, &text[end..]))
}

/// The stub's `Node.start_tier` signature: a keyword per option of the
/// tier's table (`TierOptions::FIELDS`), in its order.
fn stub_start_tier(text: &str) -> Result<String, String> {
    let head = "    def start_tier(\n        self,\n        dirs: Sequence[_Path],\n        *,\n";
    let start = text.find(head).ok_or("the stub has no Node.start_tier")? + head.len();
    let end = text[start..].find("    ) -> Tier: ...").map(|i| start + i).ok_or("Node.start_tier does not end")?;
    let params: String = cxlkv_platform::TierOptions::FIELDS
        .iter()
        .map(|f| format!("        {}: Optional[{}] = None,\n", f.name, if f.integer { "int" } else { "float" }))
        .collect();
    Ok(format!("{}{}{}", &text[..start], params, &text[end..]))
}

/// Comment lines (`// ...`) of `text`, wrapped at 76 columns, indented.
fn comment(text: &str, indent: &str) -> String {
    let mut out = String::new();
    let mut line = String::new();
    for w in text.split_whitespace() {
        if !line.is_empty() && indent.len() + 3 + line.len() + 1 + w.len() > 80 {
            out += &format!("{indent}// {line}\n");
            line.clear();
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line += w;
    }
    if !line.is_empty() {
        out += &format!("{indent}// {line}\n");
    }
    out
}

/// The C enum `cxlkv_result`, as cbindgen writes enums (C23 and C++ get
/// the underlying type).
fn c_enum() -> String {
    let mut s = comment(
        "The result of every call. `CXLKV_RESULT_OK` is not zero; numbers are never reused. Codes 1001 to \
         1099 are core's errors, numbered as in Rust's `cxlkv_core::Error` plus 1000.",
        "",
    );
    s += "enum cxlkv_result\n#if defined(__cplusplus) || __STDC_VERSION__ >= 202311L\n  : uint32_t\n\
          #endif // defined(__cplusplus) || __STDC_VERSION__ >= 202311L\n {\n";
    for &c in Code::ALL {
        s += &comment(c.doc(), "  ");
        s += &format!("  CXLKV_RESULT_{} = {},\n", c.name(), c as u32);
    }
    s += "};\n#ifndef __cplusplus\n#if __STDC_VERSION__ >= 202311L\ntypedef enum cxlkv_result cxlkv_result;\n\
          #else\ntypedef uint32_t cxlkv_result;\n#endif // __STDC_VERSION__ >= 202311L\n#endif // __cplusplus\n";
    s
}

fn header(root: &Path) -> Result<(), String> {
    let dir = root.join("ffi-c");
    let mut config =
        cbindgen::Config::from_file(dir.join("cbindgen.toml")).map_err(|e| format!("cbindgen.toml: {e}"))?;
    let v = env!("CARGO_PKG_VERSION");
    let mut parts = v.split('.');
    let mut next = || parts.next().unwrap_or("0").to_string();
    let (major, minor, patch) = (next(), next(), next());
    config.after_includes = Some(format!(
        "\n#define CXLKV_VERSION_MAJOR {major}\n#define CXLKV_VERSION_MINOR {minor}\n#define CXLKV_VERSION_PATCH \
         {patch}\n#define CXLKV_VERSION_STRING \"{v}\"\n\n{}",
        c_enum()
    ));
    let b = cbindgen::Builder::new().with_crate(&dir).with_config(config).generate().map_err(|e| e.to_string())?;
    b.write_to_file(dir.join("include/cxlkv.h"));
    Ok(())
}

/// Rewrites the members of `class Result` in the Python stub.
fn stub(root: &Path) -> Result<(), String> {
    let path = root.join("ffi-python/python/cxlkv/_cxlkv.pyi");
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let head =
        "class Result(enum.IntEnum):\n    \"\"\"The result codes of cxlkv, as in the C API (OK is 1000).\"\"\"\n\n";
    let start = text.find(head).ok_or("the stub has no class Result")? + head.len();
    let end = text[start..].find("\n\n").map(|i| start + i).ok_or("class Result does not end")?;
    let members: Vec<String> = Code::ALL.iter().map(|&c| format!("    {} = {}", c.name(), c as u32)).collect();
    let out = format!("{}{}{}", &text[..start], members.join("\n"), &text[end..]);
    let out = stub_format(&out)?;
    let out = stub_start_tier(&out)?;
    if out != text {
        std::fs::write(&path, out).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(())
}
