# dtcoord on Debian 12, built exactly as CI builds and tests it (scripts/build.sh).
#   docker build -f docker/coordinator.Dockerfile -t dt-coordinator .
#   docker run -p 50051:50051 -p 9464:9464 -v dt-state:/var/lib/dt -e WANDB_API_KEY=... dt-coordinator
FROM debian:12
COPY . /src
WORKDIR /src
RUN scripts/build.sh --install /opt/dt --target dtcoord --target dtctl
EXPOSE 50051 9464
VOLUME /var/lib/dt
ENTRYPOINT ["/opt/dt/bin/dtcoord", "--listen", "0.0.0.0:50051", "--metrics-listen", "0.0.0.0:9464", "--state-dir", "/var/lib/dt/coord"]
