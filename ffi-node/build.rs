//! Sets the linker options a Node addon needs (napi symbols resolved at load).
fn main() {
    napi_build::setup();
}
