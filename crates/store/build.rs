//! Build script: rebuild when an embedded migration changes (`sqlx::migrate!` does not track files
//! on stable Rust).

fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
