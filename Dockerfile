# lanes-exporter as a container: a static binary, built without the demo's
# simulator (-tags nodemo), on a distroless base, run as a non-root user.
#
#   docker build -t lanes-exporter .
#   docker run -p 4470:4470 -v $PWD/lanes.yaml:/etc/lanes-exporter/lanes.yaml lanes-exporter
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=devel
RUN CGO_ENABLED=0 go build -trimpath -tags nodemo \
      -ldflags "-s -w -X github.com/llmlanes/llmlanes/internal/version.version=${VERSION}" \
      -o /out/lanes-exporter ./cmd/lanes-exporter

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/lanes-exporter /usr/local/bin/lanes-exporter
COPY lanes.example.yaml /etc/lanes-exporter/lanes.yaml
USER nonroot:nonroot
EXPOSE 4470
ENTRYPOINT ["/usr/local/bin/lanes-exporter"]
CMD ["--config", "/etc/lanes-exporter/lanes.yaml", "--listen", "0.0.0.0:4470"]
