//! The composition root as a library: a runtime started from settings listens, serves until
//! its shutdown signal, and shuts down; and one started with an application of its own.

use std::path::PathBuf;

use palisade_host::settings::{ConfigFlags, resolve};
use palisade_host::{Runtime, Settings, Transport};

/// The conformance fixture (no authentication, no kill switch) on a free loopback port, with
/// its data in a directory of its own.
fn settings(name: &str) -> (Settings, PathBuf) {
    let dir = std::env::temp_dir().join(format!("palisade-host-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let data_dir = dir.display().to_string();
    let env = move |key: &str| match key {
        "PALISADE_DATA_DIR" => Some(data_dir.clone()),
        "PALISADE_LISTEN" => Some("127.0.0.1:0".to_owned()),
        _ => None,
    };
    let settings = resolve(None, &ConfigFlags::default(), false, Some("conformance"), &env).expect("settings");
    (settings, dir)
}

async fn serve_once(mut runtime: Runtime) {
    let address = runtime.local_addr().expect("an HTTP runtime has bound its listener");
    assert_ne!(address.port(), 0);
    tokio::net::TcpStream::connect(address).await.expect("the listener accepts");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(async move {
        runtime
            .serve(async move {
                let _ = stopped.await;
            })
            .await
            .expect("serve");
        runtime
    });
    let _ = stop.send(());
    let runtime = serving.await.expect("the server stops at its signal");
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_runtime_from_settings_listens_serves_and_shuts_down() {
    palisade_auth::install_crypto_provider();
    let (settings, dir) = settings("settings");
    let runtime = Runtime::start(settings, Transport::Http).await.expect("start");
    serve_once(runtime).await;
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_runtime_serves_an_application_of_its_own() {
    palisade_auth::install_crypto_provider();
    let (settings, dir) = settings("app");
    let app = palisade_apps::AppName::Conformance.build();
    let runtime = Runtime::start_with_app(settings, Transport::Http, app).await.expect("start");
    serve_once(runtime).await;
    let _ = std::fs::remove_dir_all(dir);
}
