# busyguard: build with the Rust toolchain, ship only the binary on a distroless base
# (glibc and CA roots, no shell, user 65532). `docker build -t busyguard:VERSION .` (VERSION: `busyguard --version`)
ARG RUST_VERSION=1.95

FROM docker.io/library/rust:${RUST_VERSION}-slim-bookworm AS build
WORKDIR /src
# The commit, for `busyguard --version` and busyguard_build_info (.git is not copied in).
ARG BUSYGUARD_COMMIT=unknown
ENV BUSYGUARD_COMMIT=${BUSYGUARD_COMMIT}
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin busyguard \
    && cp target/release/busyguard /busyguard

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /busyguard /busyguard
USER 65532:65532
EXPOSE 8443 8080
ENTRYPOINT ["/busyguard"]
CMD ["serve"]
