# palletd container image: build with the Rust toolchain, run on a slim
# Debian with a non-root user.
FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked --bin palletd

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin palletd \
 && install -d -o palletd -g palletd -m 0700 /var/lib/palletd
COPY --from=build /src/target/release/palletd /usr/local/bin/palletd
USER palletd
# The spool: keep it on a volume so it survives the container.
VOLUME ["/var/lib/palletd"]
EXPOSE 9464
ENTRYPOINT ["/usr/local/bin/palletd"]
CMD ["run", "--config", "/etc/palletd/config.toml", "--log-format", "json"]
