# syntax=docker/dockerfile:1
# endpoints-guard: a release build in a Rust image, then only the binaries on a
# distroless, non-root runtime (glibc + libgcc, no shell, no package manager).
#
#   docker build -t endpoints-guard:dev .
#
# The image also holds watch-chaos, the test-only fault proxy the chart runs as a
# sidecar when chaos.enabled is set; the entrypoint is endpoints-guard.

FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
# Cache mounts keep the registry and build artifacts between builds; the
# binaries are copied out of the cached target folder.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p endpoints-guard -p watch-chaos --bins \
 && mkdir -p /out \
 && cp target/release/endpoints-guard target/release/watch-chaos /out/

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/endpoints-guard /usr/local/bin/endpoints-guard
COPY --from=build /out/watch-chaos /usr/local/bin/watch-chaos
# distroless "nonroot": uid/gid 65532, matching the chart's securityContext.
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/endpoints-guard"]
