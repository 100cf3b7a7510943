//! Serving the dashboard: [`Dashboard::bind`] then [`Dashboard::serve`], or
//! [`Dashboard::spawn`] beside a training run.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;

use crate::api::{router, AppState};
use crate::error::{DashboardError, Result};
use crate::runs_dir::RunsDir;

/// The address the dashboard listens on unless told otherwise: this machine only.
pub const DEFAULT_HOST: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);
/// The default port.
pub const DEFAULT_PORT: u16 = 6060;

/// A dashboard bound to its address, over one runs folder.
///
/// ```no_run
/// use atomrl_dashboard::{Dashboard, DEFAULT_HOST};
/// let d = Dashboard::bind("runs", DEFAULT_HOST, 6060)?;
/// println!("dashboard at {}", d.url());
/// d.serve()?; // until the process ends
/// # Ok::<(), atomrl_dashboard::DashboardError>(())
/// ```
#[derive(Debug)]
pub struct Dashboard {
    runs: RunsDir,
    listener: std::net::TcpListener,
    addr: SocketAddr,
}

impl Dashboard {
    /// Opens the runs folder and binds `host:port` (port 0: any free port).
    ///
    /// # Errors
    /// [`DashboardError::RunsDir`] for a missing runs folder; [`DashboardError::Serve`] when
    /// the address cannot be bound.
    pub fn bind(runs_dir: impl AsRef<Path>, host: IpAddr, port: u16) -> Result<Self> {
        let runs = RunsDir::open(runs_dir)?;
        let addr = SocketAddr::new(host, port);
        let serve_err = |source| DashboardError::Serve {
            addr: addr.to_string(),
            source,
        };
        let listener = std::net::TcpListener::bind(addr).map_err(serve_err)?;
        listener.set_nonblocking(true).map_err(serve_err)?;
        let addr = listener.local_addr().map_err(serve_err)?;
        Ok(Self {
            runs,
            listener,
            addr,
        })
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://ADDR/`.
    pub fn url(&self) -> String {
        format!("http://{}/", self.addr)
    }

    /// The warning to print when the address is reachable from other machines (`None` on a
    /// loopback address).
    pub fn exposure_warning(&self) -> Option<String> {
        (!self.addr.ip().is_loopback()).then(|| {
            format!(
                "warning: the dashboard listens on {}: anyone who can reach this machine can read every run under {} (it has no login)",
                self.addr,
                self.runs.root().display()
            )
        })
    }

    /// Serves until the process ends (on a runtime of two threads).
    ///
    /// # Errors
    /// [`DashboardError::Serve`] when the runtime cannot start or the server fails.
    pub fn serve(self) -> Result<()> {
        let addr = self.addr.to_string();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(|source| DashboardError::Serve {
                addr: addr.clone(),
                source,
            })?;
        runtime.block_on(self.run())
    }

    /// Serves from a background thread (the training process's `--dashboard`); the thread
    /// ends with the process.
    ///
    /// # Errors
    /// [`DashboardError::Serve`] when the thread cannot start.
    pub fn spawn(self) -> Result<std::thread::JoinHandle<Result<()>>> {
        let addr = self.addr.to_string();
        std::thread::Builder::new()
            .name("atomrl-dashboard".into())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|source| DashboardError::Serve {
                        addr: self.addr.to_string(),
                        source,
                    })?;
                runtime.block_on(self.run())
            })
            .map_err(|source| DashboardError::Serve { addr, source })
    }

    async fn run(self) -> Result<()> {
        let addr = self.addr.to_string();
        let err = |source| DashboardError::Serve {
            addr: addr.clone(),
            source,
        };
        let listener = tokio::net::TcpListener::from_std(self.listener).map_err(err)?;
        axum::serve(listener, router(AppState::new(self.runs)))
            .await
            .map_err(err)
    }
}
