//! Generates `include/cxlkv.h` from the crate's exports with cbindgen. The
//! file is committed; CI rebuilds and fails when it changes.

fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let mut config = cbindgen::Config::from_file(format!("{dir}/cbindgen.toml")).expect("cbindgen.toml parses");
    let v = |k: &str| std::env::var(k).expect("cargo sets the package version");
    config.after_includes = Some(format!(
        "\n#define CXLKV_VERSION_MAJOR {}\n#define CXLKV_VERSION_MINOR {}\n#define CXLKV_VERSION_PATCH {}\n\
         #define CXLKV_VERSION_STRING \"{}\"\n",
        v("CARGO_PKG_VERSION_MAJOR"),
        v("CARGO_PKG_VERSION_MINOR"),
        v("CARGO_PKG_VERSION_PATCH"),
        v("CARGO_PKG_VERSION"),
    ));
    match cbindgen::Builder::new().with_crate(&dir).with_config(config).generate() {
        Ok(b) => {
            b.write_to_file(format!("{dir}/include/cxlkv.h"));
        }
        Err(e) => panic!("cbindgen: {e}"),
    }
    // The shared library names its ABI (SONAME): a 0.x minor release may
    // break it, so 0.x libraries carry the minor too.
    let (major, minor) = (v("CARGO_PKG_VERSION_MAJOR"), v("CARGO_PKG_VERSION_MINOR"));
    let soname = if major == "0" { format!("libcxlkv.so.0.{minor}") } else { format!("libcxlkv.so.{major}") };
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,{soname}");
    println!("cargo:rerun-if-changed=src");
    println!("cargo:rerun-if-changed=cbindgen.toml");
}
