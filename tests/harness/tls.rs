//! A private CA and a TLS front: `https://` and `wss://` in front of a real
//! worker that speaks plain HTTP (neither a2a-rust's server nor the Python
//! SDK's terminates TLS itself). The front decrypts and passes the bytes on
//! unchanged, as a TLS-terminating load balancer in front of a worker
//! would; what the worker does is the worker's. The same CA's certificate
//! serves the gateway's own `[server.tls]` listener, and [`PrivateCa::connect`]
//! is a caller of it.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::rustls;
use tokio_rustls::TlsAcceptor;

use super::gateway::scratch_dir;

/// A CA made for one test, and a server certificate it signed for
/// `127.0.0.1` and `localhost`.
pub struct PrivateCa {
    /// The CA certificate, PEM, for a route's `worker_ca`.
    pub ca_pem: PathBuf,
    /// The server certificate and its key, PEM, for `[server.tls]`.
    pub cert_pem: PathBuf,
    pub key_pem: PathBuf,
    /// A client certificate the CA signed and its key, PEM, for a route's
    /// `worker_client_cert` and `worker_client_key`.
    pub client_cert_pem: PathBuf,
    pub client_key_pem: PathBuf,
    ca_der: rustls::pki_types::CertificateDer<'static>,
    cert_der: rustls::pki_types::CertificateDer<'static>,
    key_der: Vec<u8>,
}

impl PrivateCa {
    pub fn new(tag: &str) -> PrivateCa {
        use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair, SanType};
        let ca_key = KeyPair::generate().expect("CA key");
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.distinguished_name.push(
            rcgen::DnType::CommonName,
            format!("a2a-gateway test CA {tag}"),
        );
        let ca = ca_params.self_signed(&ca_key).expect("CA certificate");
        let ca_issuer = rcgen::Issuer::new(ca_params, ca_key);

        let key = KeyPair::generate().expect("server key");
        let mut params = CertificateParams::new(vec!["localhost".to_string()]).expect("params");
        params
            .subject_alt_names
            .push(SanType::IpAddress([127, 0, 0, 1].into()));
        let cert = params
            .signed_by(&key, &ca_issuer)
            .expect("server certificate");

        let client_key = KeyPair::generate().expect("client key");
        let mut client_params =
            CertificateParams::new(vec!["a2a-gateway".to_string()]).expect("client params");
        client_params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        let client = client_params
            .signed_by(&client_key, &ca_issuer)
            .expect("client certificate");

        let dir = scratch_dir(&format!("tls-{tag}"));
        let (client_cert_pem, client_key_pem) =
            (dir.join("client-cert.pem"), dir.join("client-key.pem"));
        std::fs::write(&client_cert_pem, client.pem()).expect("write client-cert.pem");
        std::fs::write(&client_key_pem, client_key.serialize_pem()).expect("write client-key.pem");
        let (ca_pem, cert_pem, key_pem) = (
            dir.join("ca.pem"),
            dir.join("cert.pem"),
            dir.join("key.pem"),
        );
        std::fs::write(&ca_pem, ca.pem()).expect("write ca.pem");
        std::fs::write(&cert_pem, cert.pem()).expect("write cert.pem");
        std::fs::write(&key_pem, key.serialize_pem()).expect("write key.pem");
        PrivateCa {
            ca_pem,
            cert_pem,
            key_pem,
            client_cert_pem,
            client_key_pem,
            ca_der: ca.der().clone(),
            cert_der: cert.der().clone(),
            key_der: key.serialize_der(),
        }
    }

    /// A TLS connection to `addr` that trusts this CA only, for the name
    /// `127.0.0.1`.
    pub async fn connect(
        &self,
        addr: SocketAddr,
    ) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(self.ca_der.clone())
            .expect("the CA as a trust anchor");
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
        let tcp = TcpStream::connect(addr).await?;
        let name = rustls::pki_types::ServerName::IpAddress(addr.ip().into());
        tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(name, tcp)
            .await
    }

    /// A TLS server with this CA's server certificate; with `client_auth`
    /// it refuses clients without a certificate this CA signed.
    fn acceptor(&self, client_auth: bool) -> TlsAcceptor {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let key = rustls::pki_types::PrivateKeyDer::Pkcs8(self.key_der.clone().into());
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .expect("TLS versions");
        let builder = if client_auth {
            let mut roots = rustls::RootCertStore::empty();
            roots
                .add(self.ca_der.clone())
                .expect("the CA as a trust anchor");
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .build()
            .expect("client verifier");
            builder.with_client_cert_verifier(verifier)
        } else {
            builder.with_no_client_auth()
        };
        let config = builder
            .with_single_cert(vec![self.cert_der.clone()], key)
            .expect("server config");
        TlsAcceptor::from(Arc::new(config))
    }
}

/// Accepts TLS on a free loopback port and passes each connection on to
/// `backend` in plain TCP. Stops when dropped.
pub struct TlsFront {
    pub addr: SocketAddr,
    handshakes: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl TlsFront {
    pub async fn start(ca: &PrivateCa, backend: SocketAddr) -> TlsFront {
        TlsFront::start_with(ca, [127, 0, 0, 1].into(), false, backend).await
    }

    /// [`TlsFront::start`] on a free port of `ip` (a loopback address).
    pub async fn start_on(ca: &PrivateCa, ip: std::net::IpAddr, backend: SocketAddr) -> TlsFront {
        TlsFront::start_with(ca, ip, false, backend).await
    }

    /// [`TlsFront::start`], refusing clients without a certificate `ca`
    /// signed (mutual TLS).
    pub async fn start_mutual(ca: &PrivateCa, backend: SocketAddr) -> TlsFront {
        TlsFront::start_with(ca, [127, 0, 0, 1].into(), true, backend).await
    }

    async fn start_with(
        ca: &PrivateCa,
        ip: std::net::IpAddr,
        client_auth: bool,
        backend: SocketAddr,
    ) -> TlsFront {
        let listener = TcpListener::bind((ip, 0)).await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let acceptor = ca.acceptor(client_auth);
        let handshakes = Arc::new(AtomicUsize::new(0));
        let counted = handshakes.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    return;
                };
                let (acceptor, counted) = (acceptor.clone(), counted.clone());
                tokio::spawn(async move {
                    // A client that refuses the certificate ends here.
                    let Ok(mut tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    counted.fetch_add(1, Ordering::SeqCst);
                    let Ok(mut plain) = TcpStream::connect(backend).await else {
                        return;
                    };
                    let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
                });
            }
        });
        TlsFront {
            addr,
            handshakes,
            task,
        }
    }

    /// TLS connections completed so far.
    pub fn handshakes(&self) -> usize {
        self.handshakes.load(Ordering::SeqCst)
    }

    /// `https://ip:port`.
    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }
}

impl Drop for TlsFront {
    fn drop(&mut self) {
        self.task.abort();
    }
}
