//! The TLS checks a config needs before it is used (they need rustls, the
//! config crate cannot make them): at start-up, by `check-config`, and by
//! a reload before it swaps anything.

/// The TLS checks the config cannot make alone (they need rustls): that
/// each key is its certificate's, for `[server.tls]` and for every route's
/// `worker_client_cert`. Run at start-up and by `check-config`.
pub fn check(cfg: &config::Config) -> Result<(), String> {
    use pingora::tls::{CertificateDer, ClientConfig, PrivateKeyDer, RootCertStore, RusTlsError};
    pingora::tls::install_default_crypto_provider();
    if let Some(tls) = &cfg.server.tls {
        check_files(tls)?;
    }
    for (i, r) in cfg.routes.iter().enumerate() {
        let Some(c) = &r.worker_client_cert else {
            continue;
        };
        let chain = c
            .certs
            .iter()
            .map(|d| CertificateDer::from(d.clone()))
            .collect();
        let key = PrivateKeyDer::try_from(c.key.clone())
            .map_err(|e| format!("routes[{i}].worker_client_key: {e}"))?;
        let (cert_path, key_path) = (c.cert_path.display(), c.key_path.display());
        match ClientConfig::builder()
            .with_root_certificates(RootCertStore::empty())
            .with_client_auth_cert(chain, key)
        {
            Ok(_) => {}
            Err(RusTlsError::InconsistentKeys(e)) => {
                return Err(format!(
                    "routes[{i}].worker_client_key: {key_path} is not the key of {cert_path}'s certificate ({e:?})"
                ))
            }
            Err(e) => {
                return Err(format!(
                    "routes[{i}].worker_client_cert: cannot present {cert_path} with {key_path}: {e}"
                ))
            }
        }
    }
    Ok(())
}

/// `[server.tls]`'s certificate and key paths as pingora takes them.
pub fn paths(tls: &config::ServerTls) -> Result<(&str, &str), String> {
    fn utf8(p: &std::path::Path) -> Result<&str, String> {
        p.to_str()
            .ok_or_else(|| format!("server.tls: {} is not a UTF-8 path", p.display()))
    }
    Ok((utf8(&tls.cert)?, utf8(&tls.key)?))
}

/// Loads `[server.tls]`'s files as pingora will when its listeners start
/// (where a bad pair panics a proxy thread and the process hangs): a
/// certificate chain and a key that belong together, or a message naming
/// both files.
fn check_files(tls: &config::ServerTls) -> Result<(), String> {
    use pingora::tls::{load_certs_and_key_files, RusTlsError, ServerConfig};
    let (cert, key) = paths(tls)?;
    let (chain, key_der) = match load_certs_and_key_files(cert, key) {
        Ok(Some(pair)) => pair,
        Ok(None) => {
            return Err(format!(
                "server.tls: {cert} holds no certificate or {key} no private key"
            ))
        }
        Err(e) => return Err(format!("server.tls: cannot load {cert} and {key}: {e}")),
    };
    match ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(chain, key_der)
    {
        Ok(_) => Ok(()),
        Err(RusTlsError::InconsistentKeys(e)) => Err(format!(
            "server.tls: {key} is not the key of {cert}'s certificate ({e:?})"
        )),
        Err(e) => Err(format!(
            "server.tls: cannot serve TLS with {cert} and {key}: {e}"
        )),
    }
}
